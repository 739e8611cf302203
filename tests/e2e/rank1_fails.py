"""A ``[job] custom_import`` that fails on rank 1 only (tests/e2e/test_job_life.py): with
LOG_RANK=0 the user would otherwise never see why the job stopped."""

import os

if os.environ.get("RANK") == "1":
    raise ValueError("this module refuses to run on rank 1")
