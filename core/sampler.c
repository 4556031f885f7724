/* sampler: in progress */
