/* kernels: in progress */
