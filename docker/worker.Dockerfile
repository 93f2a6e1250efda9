# paraplan worker image for GPU nodes, on a PyTorch CUDA base (pick the tag with BASE_IMAGE).
# Build from the repository root:  docker build -f docker/worker.Dockerfile -t paraplan-worker .
ARG BASE_IMAGE=pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY solvers ./solvers
COPY service ./service
COPY worker ./worker
COPY migrations ./migrations
COPY paraplan_cli ./paraplan_cli
# torch comes from the base image; install the worker extra without letting pip replace it.
RUN pip install --no-deps . && pip install httpx pydantic-settings 'pydantic>=2.6,<3' numpy 'pulp>=3.3,<4' \
    ortools highspy typer rich

# The token comes from the environment (PARAPLAN_WORKER_TOKEN), never from the image.
# Server URL and token come from the environment (PARAPLAN_SERVER_URL, PARAPLAN_WORKER_TOKEN).
CMD ["paraplan", "worker"]
