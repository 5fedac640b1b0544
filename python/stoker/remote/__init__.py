"""Remote storage: the objects of S3, GCS, Azure, HTTP(S) servers and the Hugging Face Hub, read
through obstore (the optional extra ``stoker[remote]``), imported where a call first needs it,
never at ``import stoker``.

URLs: ``s3://bucket/key``, ``gs://bucket/key``, ``az://container/blob``, ``http(s)://host/path``,
``hf://datasets/<org>/<name>[@<revision>]/<path>``; ``file://`` and plain paths are local.

- ``expand(urls)``: brace then glob expansion, remote or local, into a list of paths.
- ``Store.for_url(url)``: one shared client per bucket or host; ``head``, ``read`` (exact
  ranges), ``list``, ``stats``. Credentials come from the standard environment (_config.py).
- ``fetch_to_cache(url, info, cache_dir)``: the object as a complete local file, downloaded once
  per node by concurrent ranged GETs; ``cache_usage`` and ``evict`` for whoever manages space.

Errors: RemoteError (an OSError; ``url`` names the object), RemoteAuthError (credentials),
RemoteNotFound (also a FileNotFoundError).
"""

from ._cache import FetchResult, cache_usage, evict, fetch_to_cache
from ._errors import RemoteAuthError, RemoteError, RemoteNotFound
from ._store import ObjectInfo, Store
from ._expand import expand
from ._urls import is_url, local_path

__all__ = [
    "FetchResult",
    "ObjectInfo",
    "RemoteAuthError",
    "RemoteError",
    "RemoteNotFound",
    "Store",
    "cache_usage",
    "evict",
    "expand",
    "fetch_to_cache",
    "is_url",
    "local_path",
]
