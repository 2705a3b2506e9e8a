"""Shared test setup: run on XLA's CPU backend unless told otherwise, quiet logs."""

import os

os.environ.setdefault("KAUN_IR_BACKEND", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
