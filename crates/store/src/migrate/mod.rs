//! Post-copy migration: stub state, on-demand fetch, background crawl (being written).
