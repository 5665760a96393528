"""Small explicit fakes at hardware boundaries (there is no GPU in the test environment)."""
