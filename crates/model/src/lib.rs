//! Llama-family and GPT-2 stages: a slice of a model's layers, with the embedding and lm_head on the head.
