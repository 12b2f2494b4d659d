"""The CRI vocabulary every wing shares: methods, outcomes, their labels."""
