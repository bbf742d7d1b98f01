//! End-to-end tests: vmm + backends + payload guests under KVM.
