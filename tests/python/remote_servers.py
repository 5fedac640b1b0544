"""Local servers for the stoker.remote tests: nothing here reaches beyond 127.0.0.1.

- ``S3Server``: moto's S3 in a child process, with IAM authentication switched on after one user and its
  access key are made, so wrong credentials get the 403 a real bucket gives.
- ``FileServer``: a directory over HTTP/1.1 (HEAD, GET, ``Range: bytes=a-b``, ETag), which also
  plays the Hugging Face Hub for ``datasets/<org>/<name>/...`` below its root: ``/datasets/<org>/
  <name>/resolve/<rev>/<path>`` (a 302 to the file, as the Hub answers for LFS files) and
  ``/api/datasets/<org>/<name>/tree/<rev>/<dir>?recursive=true`` (JSON, paginated with a ``Link``
  header). Every revision serves the same tree; ``paths`` records what was asked.
- ``FaultProxy``: sits in front of either as the client's endpoint, forwards each request and sends
  the answer back with the faults its attributes ask for. Faults are counted, not random: a test
  sets ``fail_next = 3`` and exactly the next three requests fail.

``FileServer`` and ``FaultProxy`` are threads of the test process, ``S3Server`` a child process:
``start()`` returns once they listen, ``stop()`` joins them.
"""

from __future__ import annotations

import email.utils
import hashlib
import http.client
import http.server
import json
import os
import re
import socket
import struct
import sys
import threading
import time
import urllib.parse


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Threaded:
    """A ThreadingHTTPServer on 127.0.0.1 on a free port, served from a thread."""

    def _serve(self, handler):
        self._httpd = _Server(("127.0.0.1", 0), handler)
        self._httpd.owner = self
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


# --- S3 (moto) ---------------------------------------------------------------------------------

class S3Server:
    """moto's S3 server on 127.0.0.1, in a child process. ``access_key`` / ``secret_key`` are a
    real IAM user's of this server; any other key is refused with 403 (InvalidAccessKeyId /
    SignatureDoesNotMatch).

    A child, so that it serves at full speed beside a test process that runs under ASan's malloc
    (the ASan lane preloads it into Python, and moto's requests are mostly allocations), and so
    that its requests never wait on the test's GIL. It runs this file (``_serve_s3``) without
    the sanitizer's environment, prints its endpoint and key as one JSON line, and stops when
    its standard input closes (``stop()``, or the test process ending)."""

    def start(self):
        import subprocess

        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "PYTHONMALLOC") and not k.endswith("SAN_OPTIONS")}
        self._child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "s3"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                       text=True)
        line = self._child.stdout.readline()
        if not line:
            self._child.wait(timeout=30)
            raise RuntimeError(f"moto's S3 server did not start (exit {self._child.returncode})")
        ready = json.loads(line)
        self.url, self.access_key, self.secret_key = (ready["url"], ready["access_key"],
                                                      ready["secret_key"])
        return self

    def stop(self):
        import subprocess

        self._child.stdin.close()
        try:
            self._child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
        self._child.stdout.close()

    def client(self):
        """A boto3 S3 client with this server's valid key."""
        return _boto3_client(self.url, "s3", self.access_key, self.secret_key)

    def put(self, bucket, files):
        """Creates `bucket` (if new) and uploads ``{key: bytes}``."""
        s3 = self.client()
        try:
            s3.create_bucket(Bucket=bucket)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        for key, data in files.items():
            s3.put_object(Bucket=bucket, Key=key, Body=data)

    def env(self, endpoint=None):
        """The environment a client needs to reach this server (or `endpoint`, a proxy of it)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint or self.url}


def _boto3_client(url, service, key, secret):
    import boto3

    return boto3.client(service, endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key=secret)


def _serve_s3():
    """S3Server's child: moto's S3 on a free port of 127.0.0.1, with one IAM user whose key is
    printed (JSON) with the endpoint; authentication is switched on after that user is made. Serves
    until standard input closes."""
    import logging

    from moto import settings
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    iam = _boto3_client(url, "iam", "anything", "anything")
    iam.create_user(UserName="stoker")
    iam.put_user_policy(UserName="stoker", PolicyName="all", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="stoker")["AccessKey"]
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # read per request: authentication is on now
    print(json.dumps({"url": url, "access_key": key["AccessKeyId"],
                      "secret_key": key["SecretAccessKey"]}), flush=True)
    sys.stdin.read()
    server.stop()


# --- a directory over HTTP, and the fake Hugging Face Hub ---------------------------------------

_RESOLVE = re.compile(r"^/datasets/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$")
_TREE = re.compile(r"^/api/datasets/([^/]+)/([^/]+)/tree/([^/]+)(?:/(.*))?$")


def _etag(st):
    return '"' + hashlib.sha1(f"{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16] + '"'


class _FileHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._answer(head=True)

    def do_GET(self):
        self._answer(head=False)

    def _send(self, status, body=b"", headers=(), head=False):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if not any(name == "Content-Length" for name, _ in headers):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _answer(self, head):
        server = self.server.owner
        split = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(split.path)
        with server.lock:
            server.paths.append(self.path)
        hub = _RESOLVE.match(path) or _TREE.match(path)
        if hub and server.hf_token is not None:
            if self.headers.get("Authorization") != f"Bearer {server.hf_token}":
                return self._send(401, b'{"error":"Invalid credentials"}', head=head)
        if m := _TREE.match(path):
            return self._tree(m, urllib.parse.parse_qs(split.query), head)
        if m := _RESOLVE.match(path):
            org, name, _, rest = m.groups()
            target = "/hub-files/" + urllib.parse.quote(f"datasets/{org}/{name}/{rest}")
            return self._send(302, headers=[("Location", target)], head=head)
        if path.startswith("/hub-files/"):
            path = path[len("/hub-files"):]
        self._file(os.path.join(server.root, path.lstrip("/")), head)

    def _file(self, local, head):
        try:
            st = os.stat(local)
            if not os.path.isfile(local):
                raise FileNotFoundError(local)
        except OSError:
            return self._send(404, b"not found", head=head)
        size = st.st_size
        headers = [("ETag", _etag(st)), ("Accept-Ranges", "bytes"),
                   ("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))]
        start, end, status = 0, size, 200
        if rng := self.headers.get("Range"):
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
            if not m or m.groups() == ("", ""):
                return self._send(416, headers=[("Content-Range", f"bytes */{size}")], head=head)
            a, b = m.groups()
            if a == "":
                start, end = max(0, size - int(b)), size
            else:
                start, end = int(a), size if b == "" else min(int(b) + 1, size)
            if start >= size or start >= end:
                return self._send(416, headers=[("Content-Range", f"bytes */{size}")], head=head)
            status = 206
            headers.append(("Content-Range", f"bytes {start}-{end - 1}/{size}"))
        headers.append(("Content-Length", str(end - start)))
        body = b""
        if not head:
            with open(local, "rb") as f:
                f.seek(start)
                body = f.read(end - start)
        self._send(status, body, headers, head)

    def _tree(self, m, query, head):
        server = self.server.owner
        org, name, _, sub = m.groups()
        repo = os.path.join(server.root, "datasets", org, name)
        top = os.path.join(repo, sub or "")
        if not os.path.isdir(top):
            return self._send(404, b'{"error":"Entry not found"}', head=head)
        recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
        entries = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for d in dirnames:
                entries.append({"type": "directory", "oid": "0" * 40,
                                "path": os.path.relpath(os.path.join(dirpath, d), repo)})
            for f in sorted(filenames):
                full = os.path.join(dirpath, f)
                entries.append({"type": "file", "oid": "0" * 40, "size": os.path.getsize(full),
                                "path": os.path.relpath(full, repo)})
            if not recursive:
                break
        cursor = int(query.get("cursor", ["0"])[0])
        page = entries[cursor:cursor + server.hub_page_size]
        headers = [("Content-Type", "application/json")]
        if cursor + server.hub_page_size < len(entries):
            nxt = dict((k, v[0]) for k, v in query.items())
            nxt["cursor"] = str(cursor + server.hub_page_size)
            url = f"{server.url}{m.group(0)}?{urllib.parse.urlencode(nxt)}"
            headers.append(("Link", f'<{url}>; rel="next"'))
        self._send(200, json.dumps(page).encode(), headers, head)


class FileServer(_Threaded):
    """Serves `root` over HTTP/1.1 and plays the Hub for ``root/datasets/<org>/<name>/...``.

    ``hf_token``: when set, Hub requests without ``Authorization: Bearer <hf_token>`` get 401.
    ``hub_page_size``: entries per page of a tree listing. ``paths``: every request's path.
    """

    def __init__(self, root):
        self.root = str(root)
        self.hf_token = None
        self.hub_page_size = 1000
        self.paths = []
        self.lock = threading.Lock()

    def start(self):
        return self._serve(_FileHandler)


# --- the fault-injecting proxy ------------------------------------------------------------------

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te",
               "trailer", "upgrade"}


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._forward()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _forward(self):
        proxy = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        request_body = self.rfile.read(length) if length else None
        fault = proxy._next_fault(self.path)
        if proxy.latency:
            time.sleep(proxy.latency)
        if fault is not None:
            status, retry_after = fault
            headers = [("Content-Length", "0")]
            if retry_after is not None:
                headers.append(("Retry-After", str(retry_after)))
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            return
        upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=30)
        try:
            # The Host header travels unchanged: an S3 signature covers it.
            upstream.putrequest(self.command, self.path, skip_host=True,
                                skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_BY_HOP:
                    upstream.putheader(name, value)
            upstream.endheaders(request_body)
            response = upstream.getresponse()
            body = response.read()
            headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
        finally:
            upstream.close()
        self.send_response(response.status)
        for name, value in headers:
            if name.lower() != "content-length":
                self.send_header(name, value)
        if self.command != "HEAD":
            body = body[:len(body) - proxy._short_by(len(body))]
        declared = response.getheader("Content-Length") if self.command == "HEAD" else len(body)
        if declared is not None:
            self.send_header("Content-Length", str(declared))
        self.end_headers()
        if self.command != "HEAD":
            self._send_body(proxy, body)

    def _send_body(self, proxy, body):
        cut, how = proxy._body_fault(len(body))
        sent = 0
        while sent < cut:
            chunk = body[sent:min(cut, sent + proxy.chunk)]
            proxy._pace(len(chunk))
            with proxy.lock:  # counted before the write: the client may have it all right after
                proxy.bytes_served += len(chunk)
            self.wfile.write(chunk)
            sent += len(chunk)
        if how is not None:
            self.wfile.flush()
            if how == "reset":  # RST instead of FIN: the client sees "connection reset by peer"
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR) if how == "truncate" else None


class FaultProxy(_Threaded):
    """A proxy to ``upstream`` (``http://host:port``) that injects faults, set at any time:

    - ``latency``: seconds slept before each request is answered.
    - ``bandwidth``: bytes per second of response bodies, shared by all connections (None: no cap).
    - ``fail_next``, ``fail_status``, ``retry_after``: the next `fail_next` requests get
      `fail_status` (429 or 503) with ``Retry-After: retry_after`` (None: no header).
    - ``fail_pattern``, ``fail_pattern_status``: every request whose path matches the regex gets
      that status, for ever.
    - ``reset_next``, ``reset_after``: the next `reset_next` response bodies stop after
      `reset_after` bytes with a TCP reset.
    - ``truncate_next``, ``truncate_after``: the next `truncate_next` bodies stop after
      `truncate_after` bytes with an orderly close, while Content-Length promised the whole body.
    - ``short_next``, ``short_by``: the next `short_next` bodies lose their last `short_by` bytes
      and Content-Length says so: a body complete by HTTP's rules, shorter than the range asked.

    Counters: ``requests`` (all, faulted ones included), ``bytes_served`` (body bytes sent),
    ``faults`` (requests and bodies faulted), ``paths`` (every request's path).
    """

    def __init__(self, upstream):
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream_host, self.upstream_port = parsed.hostname, parsed.port
        self.lock = threading.Lock()
        self.latency = 0.0
        self.bandwidth = None
        self.chunk = 16 << 10
        self.fail_next, self.fail_status, self.retry_after = 0, 503, 0
        self.fail_pattern, self.fail_pattern_status = None, 500
        self.reset_next, self.reset_after = 0, 0
        self.truncate_next, self.truncate_after = 0, 0
        self.short_next, self.short_by = 0, 0
        self.requests = 0
        self.bytes_served = 0
        self.faults = 0
        self.paths = []
        self._pace_until = 0.0

    def start(self):
        return self._serve(_ProxyHandler)

    def _next_fault(self, path):
        with self.lock:
            self.requests += 1
            self.paths.append(path)
            if self.fail_pattern is not None and re.search(self.fail_pattern, path):
                self.faults += 1
                return self.fail_pattern_status, None
            if self.fail_next > 0:
                self.fail_next -= 1
                self.faults += 1
                return self.fail_status, self.retry_after
        return None

    def _body_fault(self, size):
        """(bytes to send, None | "reset" | "truncate") for the next body of `size` bytes."""
        with self.lock:
            if self.reset_next > 0 and size > self.reset_after:
                self.reset_next -= 1
                self.faults += 1
                return self.reset_after, "reset"
            if self.truncate_next > 0 and size > self.truncate_after:
                self.truncate_next -= 1
                self.faults += 1
                return self.truncate_after, "truncate"
        return size, None

    def _short_by(self, size):
        with self.lock:
            if self.short_next > 0 and size > self.short_by > 0:
                self.short_next -= 1
                self.faults += 1
                return self.short_by
        return 0

    def _pace(self, n):
        """Token bucket over all connections: each chunk takes its slot on one shared clock."""
        if not self.bandwidth:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self._pace_until)
            self._pace_until = start + n / self.bandwidth
            wait = self._pace_until - now
        time.sleep(wait)


if __name__ == "__main__" and sys.argv[1:] == ["s3"]:
    _serve_s3()
