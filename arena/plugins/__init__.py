"""Built-in methods, each in its own folder, registered like third-party plugins."""
