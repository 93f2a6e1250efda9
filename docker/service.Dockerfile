# paraplan service image: the API (uvicorn) and solver dispatchers, without torch.
# Build from the repository root:  docker build -f docker/service.Dockerfile -t paraplan-service .
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY solvers ./solvers
COPY service ./service
COPY worker ./worker
COPY migrations ./migrations
COPY paraplan_cli ./paraplan_cli
RUN pip install '.[server]'

RUN useradd --system --uid 10001 paraplan
USER paraplan
EXPOSE 8000
ENV PARAPLAN_HOST=0.0.0.0 PARAPLAN_PORT=8000
# Migrations are idempotent: every replica may run them at start; Alembic serialises on PostgreSQL.
CMD ["sh", "-c", "paraplan db upgrade && paraplan serve"]
