"""``manage.py image-build [--no-register]``: Kumo's Debian 12 guest image, built from
Debian's archive (``compute.imagebuild``) or found in its cache, and registered as a public
image (once: a second run finds it by checksum and changes nothing)."""

from django.core.management.base import BaseCommand

from compute import imagebuild
from compute.services.guest_image import guest_image_register


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        parser.add_argument(
            "--no-register", action="store_true", help="build (or find) only; register nothing"
        )

    def handle(self, *args, no_register, **options):
        built = imagebuild.build_image(log=lambda line: self.stdout.write(line))
        state = "cached" if built.cached else "built"
        self.stdout.write(f"{built.path} {built.checksum} ({state})")
        if not no_register:
            image, created = guest_image_register(built=built)
            what = "registered" if created else "already registered"
            self.stdout.write(f"image {image.pk} {image.name}: {what}")
