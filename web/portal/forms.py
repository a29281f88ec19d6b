"""The portal's forms: the push endpoint's settings (the admin's consumer form, narrowed to what a
team may change and checked the same way: the callback address policy, the content filter's and
the message types' rules with the API's messages) and the deliveries' outcome filter. Replay uses
the admin's replay form as it is (``web.admin.consumer_forms.ReplayForm``)."""

from __future__ import annotations

import copy

from django import forms

from jobs.ops.deliveries import OUTCOMES
from web.admin.consumer_forms import ConsumerForm

ENDPOINT_FIELDS = ("callback_url", "filter", "message_types", "max_deliveries_per_second")


class EndpointForm(ConsumerForm):
    class Meta(ConsumerForm.Meta):
        fields = ENDPOINT_FIELDS
        labels = {"callback_url": "Callback URL", "max_deliveries_per_second": "Max deliveries per second"}
        help_texts = {"callback_url": "Where deliveries are POSTed (absolute http or https URL).",
                      "max_deliveries_per_second": "Empty: no rate limit."}

    def __init__(self, *args, instance, **kwargs):
        # labels without a colon: a control's accessible name is its label as quoted (Callback URL, ...)
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, instance=copy.copy(instance), **kwargs)  # validation never edits the caller's row
        for name in list(self.fields):
            if name not in (*ENDPOINT_FIELDS, "loaded_at"):
                del self.fields[name]
        self.fields["callback_url"].required = True
        self.fields["callback_url"].widget.attrs.update({"inputmode": "url", "autocomplete": "off", "size": 70})
        self.order_fields(ENDPOINT_FIELDS)

    def settings(self) -> dict:
        """The consumer fields to save (``consumers.services.consumer_upsert``'s ``settings``)."""
        return {name: self.cleaned_data.get(name) for name in ENDPOINT_FIELDS if name != "callback_url"}


class OutcomeForm(forms.Form):
    """The Deliveries page's query: the outcome filter (offered as links, so a read link has no form
    either) and where the page starts."""

    outcome = forms.ChoiceField(label="Outcome", required=False,
                                choices=[("", "all"), *((o, o) for o in OUTCOMES)])
    before = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)
