"""The export step: write the ONNX graph and its tokenizer into EMBEDDING_CACHE_DIR once (a
no-op when they are there), each checked against its pinned SHA-256, then run the model once.
Needs the `export` extra (torch, transformers, the model package) unless the files exist; the
services only read what it wrote (the Dockerfile runs it in the build stage)."""

from shared.embeddings import load_embedder


def main() -> None:
    embedder = load_embedder()
    embedder.embed(["warm-up"])


if __name__ == "__main__":
    main()
