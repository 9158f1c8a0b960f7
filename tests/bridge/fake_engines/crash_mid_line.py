#!/usr/bin/env python3
"""Test double: the mux fake engine, except that its FIRST life dies in the middle of a DATA
frame (after 3 tokens of the first request). A marker file in $FAKE_STATE_DIR makes the
restarted engine behave normally."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mux_fake  # noqa: E402

marker = os.path.join(os.environ["FAKE_STATE_DIR"], "crashed-once")
if os.path.exists(marker):
    sys.exit(mux_fake.main())
open(marker, "w").close()
sys.exit(mux_fake.main(crash_after=3))
