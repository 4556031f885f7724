/* chartok: in progress */
