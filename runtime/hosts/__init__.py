"""Objects a worker process hosts for node kinds: they adapt nodes/ math and engines/ to packed batches."""
