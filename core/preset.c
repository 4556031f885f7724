/* preset: in progress */
