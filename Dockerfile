# syntax=docker/dockerfile:1
# Three stages: the native library built with gcc alone, the Python wheel that ships it,
# and a slim runtime image with just the installed wheel.

FROM debian:bookworm-slim AS hook
RUN apt-get update && apt-get install -y --no-install-recommends gcc make libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY hook/ /src/hook/
RUN make -C /src/hook

FROM python:3.11-slim-bookworm AS wheel
RUN apt-get update && apt-get install -y --no-install-recommends gcc make libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY . /src
# The wheel's build step copies hook/build into the package (setup.py); make finds it current.
COPY --from=hook /src/hook/build /src/hook/build
RUN pip wheel --no-deps --wheel-dir /wheels /src

FROM python:3.11-slim-bookworm
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 0
ENTRYPOINT ["gpushare-dra"]
CMD ["--help"]
