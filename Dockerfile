# pdscale controller image: `docker build -t pdscale .` then see deploy/.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pdscale ./pdscale
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin pdscale
USER 10001
EXPOSE 8080
ENTRYPOINT ["pdscale"]
CMD ["run", "--spec", "/etc/pdscale/spec.yaml", "--listen", "0.0.0.0:8080"]
