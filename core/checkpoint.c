/* checkpoint: in progress */
