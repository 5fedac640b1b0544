"""The GPU wing: batches copied to a GPU ahead of the consumer with fenced pinned buffers
(feed.py), and JPEG decode on the GPU (decode.py)."""
