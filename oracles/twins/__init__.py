"""Builders of the tiny seeded twins: transformers config and model classes at tiny sizes, seeded weights."""
