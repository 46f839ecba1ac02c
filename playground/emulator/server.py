"""The HTTP layer: routes Kubernetes REST paths to the registry and streams watches."""

import base64
import json
import logging
import queue
import select
import socket
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

from playground.emulator import openapi, resources, tables

from .errors import ApiError, bad_request
from .patch import APPLY_PATCH
from .registry import Write
from .requestlog import RequestRecord
from .selectors import Selection
from .store import CLOSE

log = logging.getLogger("playground.emulator")

# How often an idle watch checks whether its client went away or its timeout passed.
WATCH_POLL_SECONDS = 0.5
# Pod subresources besides status: the scheduler's binding, the kubelet's log.
POD_SUBRESOURCES = frozenset({("Pod", "binding"), ("Pod", "log")})
PAGE_NOT_FOUND = ApiError(404, "the server could not find the requested resource", "NotFound",
                          {})
HEALTH_PATHS = ("healthz", "readyz", "livez")
OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2"


class EmulatorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # hundreds of clients connect at once

    def __init__(self, address, emulator):
        super().__init__(address, ApiRequestHandler)
        self.emulator = emulator


def _query_flag(query, name):
    return query.get(name, "").lower() in ("true", "1")


def _encode_continue(obj):
    key = f'{obj["metadata"].get("namespace", "")}/{obj["metadata"]["name"]}'
    return base64.urlsafe_b64encode(key.encode()).decode()


def _decode_continue(token):
    try:
        return tuple(base64.urlsafe_b64decode(token.encode()).decode().split("/", 1))
    except (ValueError, UnicodeDecodeError):
        raise bad_request("continue key is not valid") from None


class ApiRequestHandler(BaseHTTPRequestHandler):
    server: EmulatorHTTPServer
    _record: RequestRecord | None
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked encoding for watches
    # Headers and body go out in separate writes; with Nagle on, each response waits ~40 ms
    # for the client's delayed ACK.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # one line per request is logged in _handle instead
        pass

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    def do_PATCH(self):
        self._handle("PATCH")

    def do_DELETE(self):
        self._handle("DELETE")

    # --- request plumbing ---------------------------------------------------------------

    def _handle(self, method):
        emulator = self.server.emulator
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        is_watch = method == "GET" and _query_flag(query, "watch")
        self._warnings = []  # Warning headers of the answer (unknown fields under Warn)
        self._record = RequestRecord(method, path, url.query, 500, is_watch)
        status = 500
        try:
            body = self._read_body()
            delay = emulator.faults.delay_for(method, path)
            if delay:
                time.sleep(delay)
            injected = emulator.faults.take_failure(method, path, is_watch)
            if injected:
                raise ApiError(injected, f"injected failure ({injected})")
            status = self._route(method, path, query, body, is_watch)
        except ApiError as error:
            status = error.code
            self._send_json(error.code, error.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:  # a bug in the emulator: answer like the server would, and say so
            log.exception("emulator failed on %s %s", method, self.path)
            internal = ApiError(500, "internal error in the API emulator")
            self._send_json(500, internal.status())
        if self._record:
            self._log_request(status)

    def _log_request(self, status):
        """Record the request once: watches are recorded when their stream starts."""
        assert self._record is not None  # callers check
        self.server.emulator.requests_log.add(self._record._replace(status=status))
        log.debug("%s %s %s", self._record.method, self.path, status)
        self._record = None

    def _read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        try:
            if (self.headers.get("Content-Type") or "").startswith(APPLY_PATCH):
                return yaml.safe_load(raw)  # server-side apply sends YAML (or JSON, a subset)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as error:
            raise bad_request(f"couldn't get version/kind; json parse error: {error}") from None

    def _send_json(self, code, payload):
        self._send(code, json.dumps(payload).encode())

    def _send(self, code, data, content_type="application/json"):
        if self._record:  # before the answer: a client that has it must find the request logged
            self._log_request(code)
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for warning in self._warnings:
            self.send_header("Warning", '299 - ' + json.dumps(warning))
        self.end_headers()
        self.wfile.write(data)

    # --- routing ------------------------------------------------------------------------

    def _route(self, method, path, query, body, is_watch):
        """Serve one request; returns the HTTP status sent."""
        parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/") if p]
        if parts and parts[0] in HEALTH_PATHS and method == "GET":
            self._send(200, b"ok", "text/plain; charset=utf-8")
            return 200
        if parts[:1] == ["openapi"] and method == "GET":
            return self._openapi(parts[1:])
        discovery = self._discovery(parts)
        if discovery is not None:
            if method != "GET":
                raise ApiError(405, "the server does not allow this method on the requested "
                                    "resource", "MethodNotAllowed")
            self._send_json(200, discovery)
            return 200
        if len(parts) >= 3 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise PAGE_NOT_FOUND
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        rt = resources.BY_PATH.get((group, version, rest[0]))
        if rt is None or len(rest) > 3 or (namespace is not None and not rt.namespaced):
            raise PAGE_NOT_FOUND
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if subresource is not None and not (subresource == "status" and rt.has_status) \
                and (rt.kind, subresource) not in POD_SUBRESOURCES:
            raise PAGE_NOT_FOUND
        if name is not None and rt.namespaced and namespace is None:
            raise PAGE_NOT_FOUND
        namespace = namespace or ""
        return self._serve_resource(method, rt, namespace, name, subresource, query, body,
                                    is_watch)

    def _openapi(self, parts):
        kube_version = self.server.emulator.validator.kube_version
        if parts == ["v2"]:
            # Only JSON: clients that insist on the protobuf form are told so (406).
            if OPENAPI_V2_PROTOBUF in (self.headers.get("Accept") or "") and \
                    "json" not in (self.headers.get("Accept") or ""):
                raise ApiError(406, "only application/json is served", "NotAcceptable")
            self._send(200, openapi.v2(kube_version))
            return 200
        if parts == ["v3"]:
            self._send_json(200, openapi.v3_root(kube_version))
            return 200
        document = openapi.v3(kube_version, "/".join(parts[1:])) if parts[:1] == ["v3"] else None
        if document is None:
            raise PAGE_NOT_FOUND
        self._send(200, document)
        return 200

    def _discovery(self, parts):
        """The discovery document for parts, or None when parts is not a discovery path."""
        kube_version = self.server.emulator.validator.kube_version
        host = f"{self.server.server_address[0]}:{self.server.server_address[1]}"  # type: ignore[str-bytes-safe]  # an IP address: str
        if parts == []:
            return {"paths": ["/api", "/api/v1", "/apis", "/version"] + [
                f"/apis/{g}/{v}" for g, vs in resources.group_versions().items() for v in vs]}
        if parts == ["version"]:
            return resources.version_doc(kube_version)
        if parts == ["api"]:
            return resources.api_versions_doc(host)
        if parts == ["apis"]:
            return resources.api_group_list_doc()
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in resources.group_versions():
            return resources.api_group_doc(parts[1], resources.group_versions()[parts[1]])
        if parts == ["api", "v1"]:
            return resources.api_resource_list_doc("", "v1")
        if len(parts) == 3 and parts[0] == "apis":
            return resources.api_resource_list_doc(parts[1], parts[2])
        return None

    def _serve_resource(self, method, rt, namespace, name, subresource, query, body, is_watch):
        emulator = self.server.emulator
        registry = emulator.registry
        write = Write(dry_run=query.get("dryRun") == "All",
                      field_validation=query.get("fieldValidation") or "Warn",
                      field_manager=query.get("fieldManager", ""), warnings=self._warnings)
        table = method == "GET" and tables.wants_table(self.headers.get("Accept"))
        if name is None:
            selection = Selection(rt, query.get("labelSelector", ""),
                                  query.get("fieldSelector", ""))
            if method == "GET" and is_watch:
                return self._watch(rt, namespace, selection, query, table)
            if method == "GET":
                listed = self._list(rt, namespace, selection, query)
                if table:
                    listed = tables.table(rt, listed["items"], listed["metadata"],
                                          query.get("includeObject", "PartialObjectMetadata"))
                self._send_json(200, listed)
            elif method == "POST":
                self._send_json(201, registry.create(rt, namespace, body, write))
                return 201
            elif method == "DELETE":
                self._send_json(200, registry.delete_collection(rt, namespace, selection, write))
            else:
                raise ApiError(405, "method not allowed", "MethodNotAllowed")
            return 200
        if (rt.kind, subresource) == ("Pod", "binding") and method == "POST":
            self._send_json(201, registry.bind(rt, namespace, name, body, write))
            return 201
        if (rt.kind, subresource) == ("Pod", "log") and method == "GET":
            return self._pod_log(namespace, name, query)
        if subresource in ("binding", "log"):
            raise ApiError(405, "method not allowed", "MethodNotAllowed")
        if method == "GET":
            result = emulator.store.get(rt, namespace, name)
            if table:
                result = tables.table(rt, [result], {"resourceVersion": result["metadata"].get(
                    "resourceVersion", "")}, query.get("includeObject", "PartialObjectMetadata"))
        elif method == "PUT":
            result = registry.update(rt, namespace, name, body, subresource, write)
        elif method == "PATCH":
            result = registry.patch(rt, namespace, name, self.headers.get("Content-Type"), body,
                                    subresource, write)
        elif method == "DELETE" and subresource is None:
            options = dict(body or {})  # DeleteOptions come as a body or as query parameters
            if query.get("propagationPolicy"):
                options["propagationPolicy"] = query["propagationPolicy"]
            result = registry.delete(rt, namespace, name, options, write)
        else:
            raise ApiError(405, "method not allowed", "MethodNotAllowed")
        code = 201 if write.created else 200  # an apply that created the object
        self._send_json(code, result)
        return code

    def _pod_log(self, namespace, name, query):
        """What the kubelet serves for `kubectl logs`: here, ApiEmulator.pod_logs when a node
        runs the pods in this process (`gpushare-dra playground`)."""
        emulator = self.server.emulator
        pod = emulator.store.get(resources.BY_PATH[("", "v1", "pods")], namespace, name)
        containers = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
        container = query.get("container") or (containers[0] if len(containers) == 1 else None)
        if container is None:
            raise bad_request(f"a container name must be specified for pod {name}, choose one of: "
                              f"[{' '.join(containers)}]")
        if container not in containers:
            raise bad_request(f"container {container} is not valid for pod {name}")
        if emulator.pod_logs is None or not (pod.get("spec") or {}).get("nodeName"):
            raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: no node runs it')
        text = emulator.pod_logs(namespace, name, container)
        if text is None:
            raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating')
        self._send(200, text.encode(), "text/plain")
        return 200

    def _list(self, rt, namespace, selection, query):
        items, rv = self.server.emulator.store.list(rt, namespace, selection)
        if query.get("continue"):
            after = _decode_continue(query["continue"])
            items = [o for o in items
                     if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > after]
        metadata: dict[str, object] = {"resourceVersion": str(rv)}
        limit = int(query.get("limit") or 0)
        if 0 < limit < len(items):
            metadata["continue"] = _encode_continue(items[limit - 1])
            metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        # Items of a built-in list carry no kind/apiVersion of their own.
        items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]
        return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": metadata,
                "items": items}

    # --- watch --------------------------------------------------------------------------

    def _watch(self, rt, namespace, selection, query, table=False):
        emulator = self.server.emulator
        rv_text = query.get("resourceVersion", "")
        try:
            since_rv = int(rv_text) if rv_text else 0
        except ValueError:
            raise bad_request(f"invalid resource version: {rv_text}") from None
        send_initial = _query_flag(query, "sendInitialEvents") if "sendInitialEvents" in query \
            else None
        timeout = float(query.get("timeoutSeconds") or 0)
        bookmarks = _query_flag(query, "allowWatchBookmarks")
        try:
            sub = emulator.store.watch(rt, namespace, selection, since_rv, send_initial)
        except ApiError as error:
            if error.code != 410:
                raise
            # The real server starts the stream and reports expiry as its only event.
            self._start_chunked()
            self._write_chunk({"type": "ERROR", "object": error.status()})
            self._write_chunk(None)
            return 200
        if send_initial and bookmarks:  # tells the client the initial state is complete
            emulator.store.request_bookmark(sub, {"k8s.io/initial-events-end": "true"})
        try:
            self._start_chunked()
            self._stream_events(sub, timeout, bookmarks, rt if table else None,
                                query.get("includeObject", "PartialObjectMetadata"))
            self._write_chunk(None)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            emulator.store.unsubscribe(sub)
        return 200

    def _stream_events(self, sub, timeout, bookmarks, table_rt=None, include_object=None):
        """Events until the timeout or the client goes; table_rt: each object as a one-row
        Table of that type (`kubectl get -w`)."""
        emulator = self.server.emulator
        start = time.monotonic()
        deadline = start + timeout if timeout else None
        bookmark_interval = emulator.bookmark_interval
        next_bookmark = start + bookmark_interval
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            if bookmarks and now >= next_bookmark:
                emulator.store.request_bookmark(sub)
                next_bookmark = now + bookmark_interval
            wait = WATCH_POLL_SECONDS
            if deadline is not None:
                wait = min(wait, deadline - now)
            if bookmarks:
                wait = min(wait, max(next_bookmark - now, 0))
            try:
                event = sub.events.get(timeout=wait)
            except queue.Empty:
                if self._client_gone():
                    return
                continue
            if event is CLOSE or emulator.stopping:
                return
            event_type, obj = event
            if table_rt is not None and event_type != "BOOKMARK":
                obj = tables.table(table_rt, [obj], {"resourceVersion": obj["metadata"].get(
                    "resourceVersion", "")}, include_object)
            self._write_chunk({"type": event_type, "object": obj})

    def _client_gone(self):
        """True when the client closed its end (the socket reads EOF)."""
        # poll, not select: select() fails on descriptors above 1023 (many watches at once).
        try:
            poller = select.poll()
            poller.register(self.connection, select.POLLIN | select.POLLHUP)
            if not poller.poll(0):
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _start_chunked(self):
        self._log_request(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _write_chunk(self, payload):
        """Write one event line as a chunk; payload None writes the terminating chunk."""
        if payload is None:
            self.wfile.write(b"0\r\n\r\n")
        else:
            data = json.dumps(payload).encode() + b"\n"
            self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
