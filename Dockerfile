# Small runtime image: wheels are built in a throw-away stage, so no compiler stays in the image.
# Every dependency comes from requirements.lock, hash-checked: the image runs what CI tested.
FROM python:3.11-slim AS build
WORKDIR /src
COPY requirements.lock ./
RUN pip wheel --no-cache-dir --require-hashes --wheel-dir /wheels -r requirements.lock \
 && pip install --no-cache-dir --no-index --find-links /wheels --upgrade setuptools
# gpubot alone: the simulator (sim/) is a distribution of its own, not in the image.
COPY pyproject.toml setup.py README.md ./
COPY gpubot ./gpubot
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

FROM python:3.11-slim
# A fixed uid/gid, so that files mounted into the container can be made readable by it (the SSH
# key: docker-compose.yml; Kubernetes: fsGroup in deploy/k8s/deployment.yaml).
ARG GPUBOT_UID=10001
RUN groupadd --system --gid "$GPUBOT_UID" gpubot \
 && useradd --system --uid "$GPUBOT_UID" --gid gpubot --create-home --home-dir /home/gpubot \
      --shell /usr/sbin/nologin gpubot
COPY --from=build /wheels /wheels
# /wheels holds exactly the locked set (checked against its hashes above) and gpubot's own wheel.
RUN pip install --no-cache-dir --no-index --no-deps /wheels/*.whl && rm -rf /wheels
USER gpubot:gpubot
WORKDIR /home/gpubot
ENTRYPOINT []
CMD ["gpubot", "serve"]
