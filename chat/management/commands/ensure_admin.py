"""Creates the first admin account on a fresh install and prints its password once."""
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Create an 'admin' superuser with a random password if no superuser exists yet."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, username: str, **options: Any) -> None:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("An admin account already exists; its password was shown when it was created.")
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(self.style.SUCCESS(
            f"\n  First admin account created.\n  username: {username}\n  password: {password}\n"
            "  This password is shown only now: sign in and change it under /admin/password_change/.\n"
        ))
