"""Helpers several test modules share (no tests here); fixtures live in conftest.py."""
