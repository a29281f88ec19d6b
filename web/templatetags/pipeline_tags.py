"""``{% load pipeline_tags %}{% pipeline_latest_report as report %}`` for the admin dashboard."""

from django import template

from pipeline.latest import pipeline_report_latest

register = template.Library()


@register.simple_tag
def pipeline_latest_report():
    return pipeline_report_latest()


@register.inclusion_tag("pipeline/_latest_report_link.html")
def pipeline_latest_report_link():
    return {"report": pipeline_report_latest()}
