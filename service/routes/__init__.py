"""Thin HTTP routes: parse, authorise, call a service function, shape the response."""
