//! The Backend trait over one physical GPU as one worker sees it, with the sim and cuda implementations.
