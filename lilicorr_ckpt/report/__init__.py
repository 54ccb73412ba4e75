"""What people and machines read: validate formats, inspect, smoke renderings, JSON schemas."""
