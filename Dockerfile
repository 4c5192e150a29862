# MessageX broker image: slim Python 3.11, dependencies from uv.lock, runs as a non-root user.
#
#   docker build -t messagex .
#   docker run -p 8000:8000 -e DATABASE_URL=postgresql://user:pass@db:5432/messagex \
#       -e MESSAGEX_ADMIN_USER=admin -e MESSAGEX_ADMIN_PASSWORD=... messagex
#
# Without DATABASE_URL the broker starts its embedded PostgreSQL in /data (mount a volume).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    UV_PROJECT_ENVIRONMENT=/app/.venv \
    UV_PYTHON_DOWNLOADS=never \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1 \
    UV_NO_CACHE=1

RUN pip install uv==0.13.8

WORKDIR /app

# Dependencies first (cached until uv.lock or pyproject.toml change), then the project.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project

# The project is installed editable from /app on purpose: alembic.ini and alembic/ are read
# from the source tree next to app/ (app/storage/migrations.py resolves them from there).
COPY alembic.ini ./
COPY alembic/ alembic/
COPY app/ app/
RUN uv sync --frozen --no-dev

RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/messagex messagex \
    && mkdir -p /data \
    && chown messagex:messagex /data

USER messagex

ENV PATH=/app/.venv/bin:$PATH \
    MESSAGEX_DATA_DIR=/data \
    MESSAGEX_LOG_FORMAT=json

VOLUME ["/data"]
EXPOSE 8000

# No curl in slim images: ask /healthz with Python's standard library (non-2xx raises: exit 1).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('MESSAGEX_PORT', '8000'), timeout=3)"]

CMD ["messagex", "serve", "--host", "0.0.0.0"]
