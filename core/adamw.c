/* adamw: in progress */
