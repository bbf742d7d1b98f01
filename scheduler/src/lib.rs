//! Scheduling policies without I/O (BAND, Credit, FIFO) and queue mapping, driven by a clock trait.
