//! The `statexfer` crate (see DESIGN.md). Not built yet (see README.md, "Status").
