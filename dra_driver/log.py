"""Logging: structlog over the standard library, configured once per process.

JSON lines when stderr is not a terminal (in a cluster, for log collectors), coloured
key=value lines on a terminal. Libraries that use the stdlib `logging` module (grpc, the
kubernetes client, the emulator) go through the same renderer.
"""

from __future__ import annotations

import logging
import sys

import structlog

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("auto", "json", "console")


def configure(level: str = "info", fmt: str = "auto") -> None:
    if level not in LEVELS:
        raise ValueError(f"--log-level: {level!r} is not one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"--log-format: {fmt!r} is not one of {', '.join(FORMATS)}")
    json_output = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The kubernetes client logs every request body at debug; keep it out unless asked.
    for noisy in ("urllib3", "kubernetes.client.rest"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, root.level))


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.stdlib.get_logger(name)
