"""`python -m verifier_service.worker`: the worker process of one GPU slot (process.py)."""

from verifier_service.worker import process

if __name__ == "__main__":
  process.main()
