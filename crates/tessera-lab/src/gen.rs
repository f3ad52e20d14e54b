//! Versioned dataset generator (in progress).
