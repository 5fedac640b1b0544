"""Python datasets: the producer that runs any (torch) dataset in worker processes or threads,
with torch's semantics, into shared-memory batch buffers (producer.py says which module does
what)."""
