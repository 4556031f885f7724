/* train: in progress */
