"""Llama-family model, loaders, tokenizers and sampler for the torch runner."""
