# Small runtime image: wheels are built in a throw-away stage, so no compiler stays in the image.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpubot ./gpubot
COPY gpusim ./gpusim
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[postgres]"

FROM python:3.11-slim
RUN useradd --system --create-home --home-dir /home/gpubot --shell /usr/sbin/nologin gpubot
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "gpubot[postgres]" && rm -rf /wheels
USER gpubot
WORKDIR /home/gpubot
ENTRYPOINT []
CMD ["gpubot", "serve"]
