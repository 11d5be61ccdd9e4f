//! Embedded NFSv3 server face over the kaiso store.
