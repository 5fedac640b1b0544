"""From the environment and `storage_options` to the arguments of an obstore store.

obstore reads most of the standard environment itself (AWS_ACCESS_KEY_ID, AWS_REGION,
GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_ACCOUNT_KEY, ...). What it does not read is filled in
here, and nothing more:
- S3: the endpoint from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (to allow plain http for it), and
  AWS_PROFILE: the profile's static keys, region and endpoint_url from ~/.aws/credentials and
  ~/.aws/config (or AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE); the profile "default" is used
  the same way when AWS_PROFILE is unset. SSO, role and credential_process profiles are not
  followed (obstore's own chain then applies: web identity, container, instance metadata).
- Azure: AZURE_STORAGE_CONNECTION_STRING (AccountName, AccountKey, BlobEndpoint,
  SharedAccessSignature, UseDevelopmentStorage).
- hf://: HF_ENDPOINT and HF_TOKEN (or HUGGING_FACE_HUB_TOKEN), sent as a bearer token.
"""

from __future__ import annotations

import ast
import configparser
import datetime
import os
from dataclasses import dataclass, field

from .._checks import is_int

# Our own keys, valid for every scheme: seconds, except max_retries (a count).
CLIENT_KEYS = ("timeout", "connect_timeout")
RETRY_KEYS = ("max_retries", "retry_timeout", "backoff_initial", "backoff_max")
# Per scheme, keys of ours beyond those (obstore's config keys are valid for s3, gs and az too).
SCHEME_KEYS = {"s3": ("profile",), "hf": ("endpoint", "token")}
DEFAULT_MAX_RETRIES = 10  # obstore's default, used for our own retries of short bodies too
DEFAULT_BACKOFF_INITIAL = 0.1
DEFAULT_BACKOFF_MAX = 15.0
HF_DEFAULT_ENDPOINT = "https://huggingface.co"

_ENV_PREFIXES = {"s3": ("AWS_",), "gs": ("GOOGLE_",), "az": ("AZURE_",),
                 "hf": ("HF_", "HUGGING_FACE_HUB_TOKEN"), "http": (), "https": ()}
_OBSTORE_CONFIG = {"s3": ("_aws.pyi", "S3Config"), "gs": ("_gcs.pyi", "GCSConfig"),
                   "az": ("_azure.pyi", "AzureConfig")}


@dataclass
class StoreConfig:
    """What Store.for_url builds a client from."""

    scheme: str
    config: dict = field(default_factory=dict)  # obstore config keys (s3, gs, az)
    client_options: dict = field(default_factory=dict)
    retry_config: dict = field(default_factory=dict)
    max_retries: int = DEFAULT_MAX_RETRIES
    backoff_initial: float = DEFAULT_BACKOFF_INITIAL
    backoff_max: float = DEFAULT_BACKOFF_MAX
    timeout: float = 30.0
    hf_endpoint: str = ""
    hf_headers: dict = field(default_factory=dict)
    sources: list = field(default_factory=list)  # where credentials came from, names only


def env_snapshot(scheme: str) -> tuple:
    """The environment variables that configure `scheme`: part of a client's cache key, so a
    changed environment gets a new client."""
    prefixes = _ENV_PREFIXES[scheme]
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(prefixes)))


def valid_keys(scheme: str) -> list[str]:
    ours = [*CLIENT_KEYS, *RETRY_KEYS, *SCHEME_KEYS.get(scheme, ())]
    return sorted(ours) + sorted(obstore_config_keys(scheme))


def obstore_config_keys(scheme: str) -> list[str]:
    """The config keys obstore documents for `scheme`, read from the type stubs it ships (the
    installed release's own list; only read to word an error)."""
    if scheme not in _OBSTORE_CONFIG:
        return []
    import obstore

    stub, name = _OBSTORE_CONFIG[scheme]
    try:
        with open(os.path.join(os.path.dirname(obstore.__file__), "_store", stub)) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return [n.target.id for n in node.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return []


def unknown_keys_error(scheme: str, keys) -> ValueError:
    return ValueError(f"unknown storage_options for {scheme}://: {', '.join(sorted(keys))}; "
                      f"valid: {', '.join(valid_keys(scheme))}")


def _seconds(key: str, value) -> datetime.timedelta:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"storage_options[{key!r}] must be a number of seconds, "
                         f"not {value!r}") from None
    if seconds < 0:
        raise ValueError(f"storage_options[{key!r}] must be >= 0, not {value!r}")
    return datetime.timedelta(seconds=seconds)


def build(scheme: str, storage_options: dict | None) -> StoreConfig:
    options = dict(storage_options or {})
    if scheme in ("http", "https", "hf"):
        unknown = set(options) - set(valid_keys(scheme))
        if unknown:
            raise unknown_keys_error(scheme, unknown)
    cfg = StoreConfig(scheme)
    for key in CLIENT_KEYS:
        if key in options:
            cfg.client_options[key] = _seconds(key, options.pop(key))
    if "timeout" in cfg.client_options:
        cfg.timeout = cfg.client_options["timeout"].total_seconds()
    if "max_retries" in options:
        value = options.pop("max_retries")
        if not is_int(value) or value < 0:
            raise ValueError(f"storage_options['max_retries'] must be an int >= 0, not {value!r}")
        cfg.retry_config["max_retries"] = cfg.max_retries = value
    if "retry_timeout" in options:
        cfg.retry_config["retry_timeout"] = _seconds("retry_timeout", options.pop("retry_timeout"))
    backoff = {}
    if "backoff_initial" in options:
        backoff["init_backoff"] = _seconds("backoff_initial", options.pop("backoff_initial"))
        cfg.backoff_initial = backoff["init_backoff"].total_seconds()
    if "backoff_max" in options:
        backoff["max_backoff"] = _seconds("backoff_max", options.pop("backoff_max"))
        cfg.backoff_max = backoff["max_backoff"].total_seconds()
    if backoff:
        cfg.retry_config["backoff"] = backoff
    cfg.sources += [f"storage_options[{k!r}]" for k in sorted(options)
                    if k not in ("endpoint", "region")]
    if scheme == "s3":
        _s3(cfg, options)
    elif scheme == "az":
        _azure(cfg, options)
    elif scheme == "hf":
        _hf(cfg, options)
    elif scheme == "gs":
        cfg.config = options
    elif scheme == "http":
        cfg.client_options["allow_http"] = True
    if scheme in ("s3", "gs", "az"):
        cfg.sources += [k for k, _ in env_snapshot(scheme)
                        if any(w in k for w in ("KEY", "TOKEN", "SECRET", "CREDENTIAL",
                                                "PROFILE", "SERVICE_ACCOUNT", "CONNECTION"))]
    cfg.sources = list(dict.fromkeys(cfg.sources))
    return cfg


def _s3(cfg: StoreConfig, options: dict) -> None:
    env = os.environ
    profile_name = options.pop("profile", None)
    has_keys = any(k in options for k in ("access_key_id", "aws_access_key_id",
                                          "AWS_ACCESS_KEY_ID")) or "AWS_ACCESS_KEY_ID" in env
    if not has_keys or profile_name:
        profile = read_aws_profile(profile_name or env.get("AWS_PROFILE") or "default",
                                   required=bool(profile_name or env.get("AWS_PROFILE")))
        for ours, theirs in (("access_key_id", "aws_access_key_id"),
                             ("secret_access_key", "aws_secret_access_key"),
                             ("session_token", "aws_session_token")):
            if theirs in profile:
                options.setdefault(ours, profile[theirs])
        if "region" in profile and not (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")):
            options.setdefault("region", profile["region"])
        if "endpoint_url" in profile:
            options.setdefault("endpoint", profile["endpoint_url"])
        if profile:
            cfg.sources.append(f"AWS profile {profile['__name__']!r} in {profile['__files__']}")
    endpoint = (options.get("endpoint") or env.get("AWS_ENDPOINT_URL_S3")
                or env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT"))
    if endpoint:
        options.setdefault("endpoint", endpoint)  # obstore's own precedence may differ
        if endpoint.startswith("http://"):
            cfg.client_options["allow_http"] = True
    cfg.config = options


def read_aws_profile(name: str, required: bool) -> dict:
    """The profile's keys from the shared credentials and config files ({} if neither has it;
    ValueError if `required`). ``__name__`` and ``__files__`` say where they came from."""
    home = os.path.expanduser("~")
    credentials = os.environ.get("AWS_SHARED_CREDENTIALS_FILE",
                                 os.path.join(home, ".aws", "credentials"))
    config = os.environ.get("AWS_CONFIG_FILE", os.path.join(home, ".aws", "config"))
    found, files = {}, []
    # The config file names sections "profile x" (except "default"); credentials, plain "x".
    for path, section in ((config, name if name == "default" else f"profile {name}"),
                          (credentials, name)):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except configparser.Error as e:
            raise ValueError(f"cannot parse the AWS file {path}: {e}") from None
        if parser.has_section(section):
            found.update(parser.items(section))  # credentials (read last) win
            files.append(path)
    if not files:
        if required:
            raise ValueError(f"AWS profile {name!r} is in neither {credentials} nor {config}")
        return {}
    found["__name__"], found["__files__"] = name, " and ".join(files)
    return found


def _azure(cfg: StoreConfig, options: dict) -> None:
    conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if conn and not any(k.startswith("AZURE_STORAGE_ACCOUNT") for k in os.environ):
        parts = dict(p.split("=", 1) for p in conn.split(";") if "=" in p)
        for theirs, ours in (("AccountName", "account_name"), ("AccountKey", "account_key"),
                             ("BlobEndpoint", "endpoint"), ("SharedAccessSignature", "sas_key")):
            if theirs in parts:
                options.setdefault(ours, parts[theirs])
        if parts.get("UseDevelopmentStorage", "").lower() == "true":
            options.setdefault("use_emulator", True)
        if options.get("endpoint", "").startswith("http://"):
            cfg.client_options["allow_http"] = True
        cfg.sources.append("AZURE_STORAGE_CONNECTION_STRING")
    cfg.config = options


def _hf(cfg: StoreConfig, options: dict) -> None:
    env = os.environ
    cfg.hf_endpoint = (options.get("endpoint") or env.get("HF_ENDPOINT")
                       or HF_DEFAULT_ENDPOINT).rstrip("/")
    token, source = options.get("token"), "storage_options['token']"
    if token is None:
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
            if env.get(name):
                token, source = env[name], name
                break
    if token:
        cfg.hf_headers = {"Authorization": f"Bearer {token}"}
        cfg.sources = [s for s in cfg.sources if "token" not in s] + [source]
    cfg.client_options["default_headers"] = cfg.hf_headers
    if cfg.hf_endpoint.startswith("http://"):
        cfg.client_options["allow_http"] = True
