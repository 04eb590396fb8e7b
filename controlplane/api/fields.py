"""Serializer fields that take JSON input as it is typed and as the database can hold it.

- ``CharField``: DRF turns a JSON number given for a text field into its digits; the schema
  says string, and a number where a name goes is a client's mistake, answered 400.
- ``BooleanField``: DRF also takes ``0``, ``1``, ``"yes"``, ``"off"`` and more as booleans;
  the schema says boolean, and only JSON ``true`` and ``false`` are (400 otherwise).
- ``SlugRelatedField``: DRF's CharField refuses NUL characters, its SlugRelatedField looks them
  up, and PostgreSQL fails on them (a 500).
"""

from django.db import models
from rest_framework import serializers


class CharField(serializers.CharField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class BooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "Must be true or false."}

    def to_internal_value(self, data):
        if isinstance(data, bool):
            return data
        self.fail("invalid")


class SlugRelatedField(serializers.SlugRelatedField):
    """DRF reads an empty string as null for a nullable relation; the schema says a slug or
    null, so an empty string is refused like any other slug that names nothing."""

    def run_validation(self, data=serializers.empty):
        if data == "":
            raise serializers.ValidationError("This field may not be blank.", code="blank")
        return super().run_validation(data)

    def to_internal_value(self, data):
        if isinstance(data, str) and "\x00" in data:
            raise serializers.ValidationError("Null characters are not allowed.", code="null")
        return super().to_internal_value(data)


class ModelSerializer(serializers.ModelSerializer):
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.CharField: CharField,
        models.TextField: CharField,
        models.BooleanField: BooleanField,
    }
