"""Ray offload: the producer whose batches are made by Ray actors (producer.py), and what runs in
an actor (actor.py)."""
