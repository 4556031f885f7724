/* safetensors: in progress */
