# Build: docker build -t coder-gpu-reclaimer:0.1.0 .
# The final image is distroless (no shell), runs as a non-root user, and starts the binary
# directly so SIGTERM reaches it (it then stops no more workspaces and exits within 10 s).
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin coder-gpu-reclaimer

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/coder-gpu-reclaimer /usr/local/bin/coder-gpu-reclaimer
USER nonroot:nonroot
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/coder-gpu-reclaimer"]
CMD ["run"]
