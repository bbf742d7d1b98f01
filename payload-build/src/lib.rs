//! Builds the no_std payload guests under guests/ once, for tests, benches and the demo.
