"""Built-in corpus and token shards."""
