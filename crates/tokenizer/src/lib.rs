//! Byte-level BPE from `tokenizer.json`, identical to Hugging Face `tokenizers`, and chat templates.
