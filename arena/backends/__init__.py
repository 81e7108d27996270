"""Built-in LLM backends."""
