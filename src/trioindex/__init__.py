"""trioindex."""
