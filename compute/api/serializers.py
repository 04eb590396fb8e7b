from rest_framework import serializers

from compute.choices import HostState
from compute.models import Host
from controlplane.api import fields


class HostSerializer(serializers.ModelSerializer):
    class Meta:
        model = Host
        fields = [
            "name",
            "state",
            "state_reason",
            "libvirt_uri",
            "agent_version",
            "agent_started_at",
            "capabilities",
            "last_heartbeat_at",
            "rack",
            "zone",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class HostStateSerializer(serializers.Serializer):
    state = serializers.ChoiceField(
        choices=[HostState.UP, HostState.DRAINING, HostState.MAINTENANCE]
    )
    reason = fields.CharField(max_length=200, required=False, allow_blank=True, default="")
