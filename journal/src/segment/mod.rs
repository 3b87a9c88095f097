//! Segments.
