//! Inspect.
