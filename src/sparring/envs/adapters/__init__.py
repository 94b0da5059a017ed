"""Adapters exposing other game libraries through the Sparring env protocol (optional extras)."""
