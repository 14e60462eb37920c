"""Export the ONNX model once (a no-op when present or when the torch backend is chosen)."""

from shared.embeddings import load_embedder


def main() -> None:
    embedder = load_embedder()
    embedder.embed(["warm-up"])


if __name__ == "__main__":
    main()
